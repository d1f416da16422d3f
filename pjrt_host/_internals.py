"""Every private torch and jax internal pjrt_host touches, with why, what
happens if a release removes it, and the test that pins it.

This is the list to read before a torch or jax upgrade.
``tests/test_internals.py`` reads the sources of ``pjrt_host/`` and
``plugins/`` and fails on an internal used but not listed here, on an entry
no longer used, and on a listed internal the installed torch / jax / jaxlib
no longer has (naming the entry).  Where ``pins`` is empty, that existence
check is the only pin.

What counts as an internal (the test's rule): a dotted name reached from
``torch``, ``jax`` or ``jaxlib`` (an attribute chain, an import, or
``getattr``/``hasattr`` with a constant name) with a segment that starts with
``_`` and is not a dunder; it is listed up to that segment and one more
(``torch._C.DispatchKey``, ``jax._src.xla_bridge``,
``jax._src.xla_bridge._backends``).  A private attribute read on an object
(``op._schema``) whose name pjrt_host defines nowhere is listed as
``._schema``, with a ``probe`` (an expression, torch and jax imported, whose
value must have it).  Markers pjrt_host sets on torch's objects
(``_pjrt_host``) are its own.

What torch *functions* pjrt_host replaces is a separate inventory:
``pjrt_host._torch._patches.PATCHES`` (tests/test_checkpoints.py
checks it); the replaced functions that are private are listed here too.

This module imports nothing: it is data.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["INTERNALS", "Internal", "by_name"]


@dataclass(frozen=True, slots=True)
class Internal:
    #: The dotted names as the sources reach them (see the rule above);
    #: ``.attr`` for a private attribute read on an object.
    names: tuple[str, ...]
    #: Files (from the repository root) using them, when the entry was
    #: written; documentation: the test checks that one of them exists
    #: (or a file of its name elsewhere in the sources, after a move).
    files: tuple[str, ...]
    #: Why pjrt_host needs it: what no public API gives.
    why: str
    #: What happens when a release removes or changes it.
    fallback: str
    #: Tests that fail when it changes (``tests/file.py::test_name``); empty
    #: when the existence check in tests/test_internals.py is the only pin.
    pins: tuple[str, ...] = ()
    #: For ``.attr`` names: an expression whose value has the attribute.
    probe: str | None = None


INTERNALS: tuple[Internal, ...] = (
    # -- import pjrt_host / autoload ------------------------------------------------------
    Internal(
        names=("torch.optim.optimizer._foreach_supported_types", "torch.utils._foreach_utils",
               "torch.utils._foreach_utils._foreach_supported_types"),
        files=("pjrt_host/_torch/_patches/__init__.py",),
        why="torch.optim and clip_grad_norm_ take their foreach path (one op over all parameters) only for "
            "tensor types on these lists; DTensor adds itself the same way (torch/distributed/tensor).",
        fallback="the 'foreach' patch warns and is off: optimizers take their per-parameter step on 'jax' "
                 "(correct, one program per parameter shape and op: seconds more at a cold start).",
        pins=("tests/test_fused_optimizers.py::test_the_default_step_is_foreach_and_a_schedule_stops_compiling",),
    ),
    Internal(
        names=("._import_device_backends",),
        files=("pjrt_host/__init__.py",),
        why="`import pjrt_host` after `import torch` registers the device as torch's device-backend "
            "autoload would (`torch._import_device_backends` says this torch has it).",
        fallback="read with hasattr: without it the device is registered by torch's `torch.backends` "
                 "entry point alone, as with a plain `import torch`.",
        pins=("tests/test_torch_autoload.py::test_import_pjrt_host_enables_it_with_autoload_off",),
        probe="torch",
    ),
    Internal(
        names=("._initializing",),
        files=("pjrt_host/__init__.py",),
        why="`import pjrt_host` run by torch's own autoload, in the middle of `import torch` "
            "(`torch.__spec__._initializing`, importlib's flag), must not register the device a second way.",
        fallback="read with a getattr default of False: without it the explicit registration runs during "
                 "torch's import too.",
        pins=("tests/test_torch_autoload.py::test_plain_import_torch_makes_the_device_work",),
        probe="torch.__spec__",
    ),
    # -- naming the device and its hooks ---------------------------------------------------
    Internal(
        names=("torch._C._acc.PrivateUse1Hooks", "torch._C._acc.DeviceGuard",
               "torch._C._acc.register_python_privateuseone_hook",
               "torch._C._acc.register_python_privateuseone_device_guard", "torch._C._autograd.DeviceType"),
        files=("pjrt_host/_torch/_boot/_privateuse1.py",),
        why="the accelerator hooks and device guard torch's C++ side asks a PrivateUse1 device (is_available, "
            "the current device for autograd's streams); torch offers them to Python only here.",
        fallback="none: registration fails and there is no 'jax' device; torch's openreg test backend shows "
                 "the new spelling.",
        pins=("tests/test_torch_autoload.py::test_plain_import_torch_makes_the_device_work",
              "tests/test_checkpoints.py::test_torch_accelerator_answers_for_the_device"),
    ),
    Internal(
        names=("torch._register_device_module",),
        files=("pjrt_host/_torch/_boot/_privateuse1.py",),
        why="makes `torch.jax` (the device module torch.cuda is for CUDA); what rename_privateuse1_backend "
            "documents as the next step.",
        fallback="none: `torch.jax` is missing and registration fails.",
        pins=("tests/test_torch_autoload.py::test_plain_import_torch_makes_the_device_work",),
    ),
    Internal(
        names=("torch._C._get_privateuse1_backend_name", "torch._C._get_accelerator",
               "torch._C._accelerator_getAccelerator"),
        files=("pjrt_host/_torch/_boot/_privateuse1.py", "pjrt_host/_torch/_boot/_builtin.py",
               "pjrt_host/_torch/_torch_accelerator.py", "pjrt_host/_torch/_storage_bridge.py"),
        why="who owns PrivateUse1 already (another backend: leave it) and which accelerator torch would "
            "use, read without initialising any device.",
        fallback="none: registration raises AttributeError at the first 'jax' tensor.",
        pins=("tests/test_torch_autoload.py::test_torch_builds_with_their_own_accelerator_keep_it_unless_asked",),
    ),
    # -- the tensor subclass and dispatch ----------------------------------------------------
    Internal(
        names=("torch._C.TensorBase", "torch.Tensor._make_wrapper_subclass",
               "torch._C._disabled_torch_function_impl"),
        files=("pjrt_host/_torch/_tensor.py",),
        why="a 'jax' tensor is a wrapper subclass holding a jax array (the way torch's own subclasses, "
            "DTensor and FakeTensor, are made); its __torch_function__ is torch's disabled one so that "
            "subclass handling costs nothing per op.",
        fallback="none: no 'jax' tensor can be made.",
        pins=("tests/test_torch_factories.py", "tests/test_torch_tensor_objects.py"),
    ),
    Internal(
        names=("torch._C.DispatchKey", "torch._C.DispatchKeySet", "torch._C._ExcludeDispatchKeyGuard",
               "torch._C._dispatch_has_kernel_for_dispatch_key", "._op_dk", "torch.ops.aten.matmul.out._op_dk"),
        files=("pjrt_host/_torch/_dispatch.py", "pjrt_host/_torch/_boot/_autocast.py",
               "pjrt_host/_torch/_boot/_autograd_kernels.py"),
        why="kernels registered per dispatch key, torch's own kernels of a key for a composite op "
            "(`OpOverload._op_dk`, what `OpOverload.decompose` uses), re-dispatch below the device's key, "
            "and whether an in-place op has an ADInplaceOrView kernel (the foreach ops have none: the "
            "device's kernel counts their writes in the targets' versions).",
        fallback="none for the keys; without `_op_dk` composite ops fall to decompositions or the CPU "
                 "fallback (tests fail on the op counts).",
        pins=("tests/test_compile.py::test_a_users_custom_op_runs_eagerly_and_inside_the_compiled_graph",
              "tests/test_torch_errors.py::test_foreach_in_place_ops_count_their_writes_as_cpu_does",
              "tests/test_torch_cpu_parity.py::test_matmul_out_writes_once_with_cpus_values_and_version"),
        probe="torch.ops.aten.add.Tensor",
    ),
    Internal(
        names=("._schema",),
        files=("pjrt_host/_torch/_dispatch.py", "pjrt_host/_torch/_signatures.py", "pjrt_host/_torch/_cpu_fallback.py",
               "pjrt_host/_torch/_view_ops.py", "pjrt_host/_torch/_c10d/_functional.py",
               "pjrt_host/_torch/_c10d/_dispatcher_ops.py", "pjrt_host/_compile/_interpreter.py"),
        why="an OpOverload's schema (argument names, alias and write annotations): how in-place, out= and "
            "view ops are told apart; torch has no public accessor.",
        fallback="none: every op fails to dispatch.",
        pins=("tests/test_torch_cpu_parity.py", "tests/test_torch_views.py"),
        probe="torch.ops.aten.add.Tensor",
    ),
    Internal(
        names=("torch._ops.OpOverload", "torch._ops.OpOverloadPacket", "torch._ops.HigherOrderOperator"),
        files=("pjrt_host/_compile/_dynamo_backend.py", "pjrt_host/_compile/_interpreter.py",
               "pjrt_host/_torch/_modules.py"),
        why="isinstance checks on graph node targets (torch exports these classes only from torch._ops).",
        fallback="none: graphs cannot be interpreted.",
        pins=("tests/test_compile.py::test_inference_is_one_graph_with_zero_eager_ops",),
    ),
    Internal(
        names=("torch._C._meta_in_tls_dispatch_include", "torch._C._set_meta_in_tls_dispatch_include",
               "torch.utils._mode_utils.no_dispatch", "torch.utils._python_dispatch._get_current_dispatch_mode_stack"),
        files=("pjrt_host/_torch/_storage_ops.py", "pjrt_host/_torch/_view_ops.py",
               "pjrt_host/_compile/_interpreter.py"),
        why="running torch's meta kernels for shapes and view metadata without re-entering the device's "
            "dispatch, and knowing whether a dispatch mode (FakeTensor, a user's) is active.",
        fallback="none: view ops and storage ops fail.",
        pins=("tests/test_torch_views.py",),
    ),
    Internal(
        names=("torch._debug_has_internal_overlap",),
        files=("pjrt_host/_torch/_meta.py",),
        why="an in-place write into a tensor whose elements overlap (an expanded view) raises torch's own "
            "error, as CPU does; torch exposes its overlap check only under this name.",
        fallback="none: in-place ops on 'jax' tensors raise AttributeError.",
        pins=("tests/test_bad_inputs.py::test_the_device_refuses_what_cpu_refuses",),
    ),
    Internal(
        names=("torch.ops.aten._native_batch_norm_legit_functional.default", "torch.ops.aten._linalg_check_errors"),
        files=("pjrt_host/_torch/_storage_ops.py", "pjrt_host/_lowerings/ops_linalg.py"),
        why="private ATen ops the device runs: batch norm's functional form (running statistics written "
            "back) and linalg's error check (reads `info`).",
        fallback="the lowering table is keyed by name strings, so import never breaks; a renamed op runs "
                 "through the CPU fallback or the missing-lowering error.",
        pins=("tests/test_compile.py::test_batchnorm_running_stats_are_written_inside_the_call",
              "tests/test_linalg.py"),
    ),
    # -- storage, serialization, printing ----------------------------------------------------
    Internal(
        names=("torch._C._construct_storage_from_data_pointer",),
        files=("pjrt_host/_torch/_storage_bridge.py",),
        why="an UntypedStorage on the 'jax' device over memory pjrt_host owns (no C++ allocator can be "
            "registered from Python).",
        fallback="none: `untyped_storage()` of a 'jax' tensor fails.",
        pins=("tests/test_checkpoints.py::test_untyped_storage_of_jax_tensors",),
    ),
    Internal(
        names=("torch.serialization._package_registry",),
        files=("pjrt_host/_torch/_storage_bridge.py",),
        why="picking a free priority for the device's serialization package "
            "(`register_package` needs one).",
        fallback="none: torch.save / torch.load of 'jax' tensors fail.",
        pins=("tests/test_torch_serialization.py",),
    ),
    Internal(
        names=("torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3", "torch._utils._rebuild_parameter",
               "torch._utils._rebuild_parameter_with_state", "torch.storage._new_dtypes"),
        files=("pjrt_host/_torch/_tensor.py",),
        why="a 'jax' tensor pickles (torch.save, deepcopy) as torch's own tensors do, so that the "
            "weights_only unpickler accepts it: the same rebuild functions, chosen by dtype as torch does.",
        fallback="none: saving fails, or loading with weights_only=True refuses the file.",
        pins=("tests/test_torch_serialization.py::test_every_held_dtype_round_trips_bit_exactly",
              "tests/test_torch_serialization.py::test_newer_dtype_parameter_round_trips"),
    ),
    Internal(
        names=("torch._tensor_str", "torch._tensor_str._tensor_str", "torch._tensor_str._add_suffixes"),
        files=("pjrt_host/_torch/_printing.py",),
        why="repr of a 'jax' tensor is torch's, formatted from the CPU copy, with device='jax:N' added.",
        fallback="none: printing a 'jax' tensor raises.",
        pins=("tests/test_torch_moves.py::test_printing",
              "tests/test_spmd.py::test_cpu_printing_numpy_and_save_gather"),
    ),
    # -- modules, autograd, generators --------------------------------------------------------
    Internal(
        names=("torch.nn.Module._apply", "._parameters"),
        files=("pjrt_host/_torch/_patches/__init__.py", "pjrt_host/_torch/_modules.py"),
        why="module.to('jax') keeps parameter objects and tied weights (replaces `_apply`, listed in "
            "PATCHES; reads a module's own `_parameters`).",
        fallback="none: the patch fails to install.",
        pins=("tests/test_torch_habits.py::test_to_jax_keeps_tied_weights_and_parameter_objects",),
        probe="torch.nn.Linear(1, 1)",
    ),
    Internal(
        names=("torch.autograd._engine_run_backward", "torch._C._current_graph_task_id"),
        files=("pjrt_host/_torch/_patches/__init__.py", "pjrt_host/_torch/_backward.py", "pjrt_host/_torch/_meta.py"),
        why="a device error inside backward raises at backward(), not abort() (the replacement is in "
            "PATCHES); whether the current thread is inside a backward.",
        fallback="none: the patch fails to install.",
        pins=("tests/test_torch_autoload.py::test_patches_are_the_inventory_deferred_where_possible_and_can_be_switched_off",),
    ),
    Internal(
        names=("torch._C.Generator",),
        files=("pjrt_host/_torch/_patches/__init__.py", "pjrt_host/_torch/_generators.py"),
        why="torch.Generator(device='jax'): torch.Generator is this C++ class, whose metaclass is patched "
            "(PATCHES).",
        fallback="none: the patch fails to install.",
        pins=("tests/test_torch_habits.py::test_device_generator_drives_the_devices_random_ops",),
    ),
    Internal(
        names=("torch._C", "torch._C._get_math_sdp_enabled", "torch._C._SDPBackend.MATH"),
        files=("pjrt_host/_torch/_sdpa.py",),
        why="scaled_dot_product_attention honours sdpa_kernel: torch asks a PrivateUse1 device no backend "
            "choice, so the device reads torch's backend flags (`_get_*_sdp_enabled`, by name from a table "
            "with getattr defaults) and answers `_fused_sdp_choice` with MATH.",
        fallback="a flag missing from torch reads as off; without `_SDPBackend` the module fails to import.",
        pins=("tests/test_torch_sdpa.py::test_only_backends_the_device_lacks_raise_torchs_error",
              "tests/test_torch_sdpa.py::test_fused_sdp_choice_answers_for_the_device"),
    ),
    # -- torch.distributed ---------------------------------------------------------------------
    Internal(
        names=("torch._C._distributed_c10d._create_work_from_future",
               "torch.distributed.distributed_c10d._resolve_process_group"),
        files=("pjrt_host/_torch/_c10d/_group.py", "pjrt_host/_torch/_c10d/_functional.py"),
        why="a Work object for the device's process group (what c10d's Python backends return), and the "
            "group a functional collective names.",
        fallback="none: collectives on 'jax' tensors fail.",
        pins=("tests/test_torch_distributed.py::test_collectives_ddp_dtensor_fsdp2_under_pjrt_host_launch",),
    ),
    # -- torch.compile --------------------------------------------------------------------------
    Internal(
        names=("torch._dynamo.backends", "torch._decomp.core_aten_decompositions"),
        files=("pjrt_host/_compile/_dynamo_backend.py",),
        why="the backend is built on dynamo's `aot_autograd` helper (torch.compile backends have no "
            "public one) and decomposes with torch's core ATen table.",
        fallback="none: torch.compile(backend='jax') fails.",
        pins=("tests/test_compile.py::test_backend_is_registered_and_loads_lazily",
              "tests/test_compile.py::test_backward_equals_eager_and_the_forward_runs_no_eager_op"),
    ),
    Internal(
        names=("torch._dynamo.aot_compile_types", "torch.fx._graph_pickler.GraphPickler",
               "torch.fx._graph_pickler.Options", "torch._guards.TracingContext", "torch._guards.tracing",
               "torch._subclasses.FakeTensorMode", "torch._functorch.config"),
        files=("pjrt_host/_compile/_dynamo_backend.py",),
        why="torch's AOT path (`torch.compile(...).aot_compile`, `save_compiled_function`, "
            "`torch.compiler.load_compiled_function`) takes a backend's result only as a "
            "`SerializableCallable` (torch 2.13 has no public name for the class); the backend pickles "
            "dynamo's graph with torch's graph pickler, as torch's own GraphModuleSerializableCallable does, "
            "runs AOTAutograd again on its fake inputs under a TracingContext in the loading process, and "
            "turns off AOTAutograd's cache flags the AOT path sets (its entries hold inductor OutputCode only).",
        fallback="without aot_compile_types the backend returns AOTAutograd's callable as it is: torch.compile "
                 "works, aot_compile refuses the backend; a change of the others fails aot_compile or the load.",
        pins=("tests/test_compile.py::test_a_second_process_runs_an_aot_compiled_function_without_dynamo",
              "tests/test_compile.py::test_pins_aot_autograds_output_metadata"),
    ),
    Internal(
        names=("torch._functorch._aot_autograd.schemas",),
        files=("pjrt_host/_compile/_graph_runtime.py", "pjrt_host/_compile/_dynamo_backend.py"),
        why="outputs of an inference graph that share storage in eager come back from one jitted program as "
            "arrays of their own; the backend makes again those AOTAutograd leaves to the graph, and only "
            "those: it reads AOTAutograd's metadata of the graph being compiled (`TracingContext.fw_metadata`, "
            "TracingContext listed above: `output_info`, one per user output after "
            "`num_mutated_inp_runtime_indices` graph outputs) and compares each entry's `output_type` with "
            "`schemas.OutputType.non_alias` (AOTAutograd regenerates the other kinds itself, from an input or "
            "a base output, by its ViewMeta replay; replacing one of those under it fails its shape "
            "assertion: fuzz finding 3, docs/fuzzing.md).",
        fallback="an import error or an attribute error at the first compile of an inference graph (loud, "
                 "by design); a changed meaning of the metadata fails the pins (outputs that share storage in "
                 "eager, the metadata's layout).",
        pins=("tests/test_compile.py::test_pins_aot_autograds_output_metadata",
              "tests/test_compile.py::test_outputs_that_alias_each_other_share_storage_as_in_eager",
              "tests/test_compile.py::test_aliasing_outputs_meet_aot_autograds_view_replay_as_aot_eager_on_cpu_does"),
    ),
    Internal(
        names=("torch.compiler._compile_session_context", "torch._dynamo.aot_compile"),
        files=("pjrt_host/_torch/_hiding.py", "pjrt_host/_torch/_patches/__init__.py"),
        why="the AOT path's capture (`aot_compile_fullgraph`) runs outside torch's compile session, so "
            "`torch.compiler.is_compiling()` is False while dynamo traces and a 'jax' tensor is not hidden "
            "from it; the `aot_compile` patch runs it inside the session, as dynamo's own compile path does.",
        fallback="aot_compile of a function of 'jax' tensors fails in dynamo (an unknown Python object).",
        pins=("tests/test_compile.py::test_a_second_process_runs_an_aot_compiled_function_without_dynamo",),
    ),
    Internal(
        names=("torch._dynamo.reset",),
        files=("pjrt_host/_check/_sections/_compile.py",),
        why="`check`'s compile section starts each model from an empty dynamo cache.",
        fallback="none: the compile section fails.",
        pins=("tests/test_compile.py::test_compile_after_reset",),
    ),
    Internal(
        names=("torch._disable_dynamo",),
        files=("pjrt_host/_compile/_call_jax.py",),
        why="dynamo must not trace into call_jax's eager runner; torch.compiler.disable would import "
            "dynamo when pjrt_host's module is imported, torch._disable_dynamo only when first called.",
        fallback="none: call_jax fails to import.",
        pins=("tests/test_interop.py",),
    ),
    Internal(
        names=("torch._C._dynamo.eval_frame", "torch._C._dynamo.eval_frame._FrameAction.SKIP",
               "torch._C._dynamo.eval_frame._FrameExecStrategy", "torch._dynamo.symbolic_convert",
               "torch._dynamo.variables", "torch._dynamo.variables.torch_function._is_attr_overridden",
               "torch._guards.CompileContext"),
        files=("pjrt_host/_torch/_hiding.py", "pjrt_host/_torch/_patches/__init__.py"),
        why="dynamo sees a 'jax' tensor as a plain tensor: code marked SKIP for dynamo, 'this thread is "
            "compiling' from the CompileContext, and attribute reads under a torch-function mode "
            "(docs/compile.md, 'Private torch behaviours'; the replaced "
            "TensorWithTFOverrideVariable.var_getattr is the 'dynamo_attributes' row of _patches.INVENTORY).",
        fallback="none: compiled graphs break at every 'jax' tensor or fail under a default-device mode.",
        pins=("tests/test_compile.py::test_pins_the_dynamo_internals_read_under_a_mode",
              "tests/test_compile.py::test_compiles_under_a_default_device_mode",
              "tests/test_compile.py::test_compile_after_reset"),
    ),
    Internal(
        names=("torch._functorch.aot_autograd._aot_export_function", "torch._export.utils._compiling_state_context",
               "torch._subclasses.fake_tensor", "torch.utils._pytree"),
        files=("pjrt_host/_compile/_trace.py",),
        why="tracing a torch function to an ATen graph for assume_pure / torch functions as JAX functions: "
            "AOT export of a function (not a module) on fake tensors, with dynamo's compiling flag set.",
        fallback="none: assume_pure and call_torch fail to trace.",
        pins=("tests/test_interop.py::test_function_values_and_gradients_over_shapes_a_b_a_b",),
    ),
    Internal(
        names=("torch.utils._pytree.tree_flatten", "torch.utils._pytree.tree_leaves", "torch.utils._pytree.tree_map",
               "torch.utils._pytree.tree_unflatten"),
        files=("pjrt_host/_compile/_trace.py", "pjrt_host/_torch/_backward.py", "pjrt_host/_check/_opinfo.py",
               "pjrt_host/_check/_sections/_kernels.py"),
        why="flattening arguments and results the way torch's own tracing (AOT export, dynamo) flattens "
            "them, torch's containers included; this torch has no public pytree module.",
        fallback="none: those modules fail to import; a public `torch.utils.pytree`, where a torch has it, "
                 "is the replacement.",
    ),
    Internal(
        names=("torch.utils._python_dispatch.TorchDispatchMode",),
        files=("pjrt_host/_check/_sections/_kernels.py",),
        why="the report card's kernels section records the ATen calls of an op (its arguments as the "
            "lowering gets them) while torch CPU runs OpInfo samples; a dispatch mode is the only way torch "
            "shows the calls below the Python API.",
        fallback="none: the kernels section fails with the import error; the other sections run.",
        pins=("tests/test_check.py::test_cpu_ref_quick_passes_every_section",),
    ),
    Internal(
        names=("torch.nn.utils.stateless._reparametrize_module",),
        files=("pjrt_host/_compile/_pure.py", "pjrt_host/interop.py"),
        why="a context in which a module's parameters and buffers are given values, ties kept "
            "(`tie_weights=True`), around more than forward (the training flag is set inside); "
            "torch.func.functional_call is built on it but only calls forward.",
        fallback="none: assume_pure on modules and extract_jax fail; torch.func.functional_call is the "
                 "nearest public replacement.",
        pins=("tests/test_interop.py::test_module_values_and_gradients_and_optimizer_training",),
    ),
    Internal(
        names=("torch.testing._internal.common_methods_invocations",),
        files=("pjrt_host/_check/_opinfo.py",),
        why="`check`'s ops section runs torch's OpInfo database, as tests/test_opinfo.py does.",
        fallback="none: the ops section fails (the other sections still run).",
        pins=("tests/test_opinfo.py",),
    ),
    Internal(
        names=("._expr",),
        files=("pjrt_host/_compile/_padded_graph.py",),
        why="a graph placeholder's size as it was traced (`SymNode._expr`): a guard can narrow the "
            "symbol to one value after the graph recorded expressions of it, and `SymNode.expr` then "
            "reports the value; the symbol is needed to evaluate those expressions at the call's sizes.",
        fallback="AttributeError out of the compiled call of such a graph (the pin fails); binding only "
                 "`expr`'s symbols would keep the program's own result for the narrowed outputs.",
        pins=("tests/test_dynamic_shapes.py::test_a_compiled_view_of_sizes_a_guard_narrowed_to_one_value_is_cpus",),
        probe="torch.fx.experimental.symbolic_shapes.ShapeEnv().create_unbacked_symint().node",
    ),
    # -- jax and jaxlib -------------------------------------------------------------------------
    Internal(
        names=("jax._src.xla_bridge", "jax._src.xla_bridge._backend_factories", "jax._src.xla_bridge._backend_lock",
               "jax._src.xla_bridge._backends", "jax._src.xla_bridge._init_backend", "jax._src.xla_bridge._plugin_lock",
               "jax._src.xla_bridge._plugins_registered"),
        files=("pjrt_host/_runtime.py", "pjrt_host/_process.py", "plugins/cpu_ref/pjrt_host_cpu_ref/__init__.py"),
        why="the one client of the chosen plugin becomes jax's backend, and jax stops discovering its own "
            "plugins (a plugin for absent hardware fails noisily or takes locks); whether jax's backends "
            "exist yet.",
        fallback="none: the client cannot be created.",
        pins=("tests/test_runtime.py::test_jax_used_before_the_client_still_works",
              "tests/test_runtime.py::test_cpu_ref_runs_a_jitted_matmul_with_correct_numbers"),
    ),
    Internal(
        names=("jax._src.distributed",),
        files=("pjrt_host/_process.py", "pjrt_host/_collectives.py"),
        why="jax.distributed's global state (the client and service pjrt_host starts and reads).",
        fallback="none: multi-process start-up fails.",
        pins=("tests/test_distributed.py",),
    ),
    Internal(
        names=("jax._src.distributed._jax", "jaxlib._jax", "jaxlib._jax.get_distributed_runtime_service"),
        files=("pjrt_host/_process.py", "pjrt_host/_coordination_service.py"),
        why="jax.distributed.initialize() starts the coordination service inside process 0, not recoverable, "
            "and its clients abort the process when a peer dies; pjrt_host starts the service in a child "
            "process of its own with jaxlib's constructor (recoverable=True) and has initialize() skip starting "
            "one for the call, so a dead rank's survivors get a Python error and can save their state.",
        fallback="PJRT_HOST_COORDINATION_SERVICE=rank0: jax's own start-up, where a dead peer aborts the "
                 "survivors (docs/distributed.md, 'Dead peers').",
        pins=("tests/test_dead_peers.py::test_rank_1_killed_mid_training",
              "tests/test_dead_peers.py::test_rank_0_killed_mid_training"),
    ),
    Internal(
        names=("._dynamo_dynamic_indices",),
        files=("pjrt_host/_torch/_dynamic_dims.py",),
        why="torch._dynamo.mark_dynamic(t, d) writes its marks on the tensor; no public API reads them back, "
            "and eager dynamic dimensions honour them as dynamo does.",
        fallback="read with getattr and a default: without it mark_dynamic does nothing in eager, and a dim "
                 "becomes dynamic at its third size at a place.",
        pins=("tests/test_dynamic_shapes.py::test_mark_dynamic_pads_at_the_first_call",),
        probe="(lambda t: (torch._dynamo.mark_dynamic(t, 0), t)[1])(torch.zeros(2))",
    ),
    Internal(
        names=("jax._src.clusters", "jax._src.clusters.ClusterEnv._cluster_types"),
        files=("pjrt_host/_process.py",),
        why="jax's cluster detection (SLURM, Open MPI, ...) gives the layout when no torchrun variables "
            "are set.",
        fallback="none while PJRT_HOST_CLUSTER_DETECTION is on (the default); =0 skips it.",
        pins=("tests/test_distributed.py::test_layout_from_slurm_through_jax_cluster_detection",),
    ),
    Internal(
        names=("jax._src.compilation_cache", "jax._src.compilation_cache._cache",
               "jax._src.compilation_cache._cache_initialized", "jax._src.compilation_cache._cache_initialized_mutex",
               "jax._src.compilation_cache_interface"),
        files=("pjrt_host/_jax_settings.py", "pjrt_host/_program_cache.py"),
        why="the program cache on disk is jax's persistent cache with pjrt_host's store (size bound, "
            "per plugin and jaxlib version) in jax's cache interface.",
        fallback="a changed interface warns and programs stay in memory; the device works.",
        pins=("tests/test_program_cache.py::test_jax_internals_the_cache_relies_on",),
    ),
    Internal(
        names=("jax._src.lax",),
        files=("pjrt_host/_program_cache.py",),
        why="jaxlib binds XLA:CPU's LAPACK kernels only while lowering a program that calls them; a program "
            "loaded untraced calls them with nothing bound (a segmentation fault) unless they are bound first, "
            "as jax's own loader of exported programs does.",
        fallback="programs are traced before jax's cache hit, as before the untraced store (no crash, slower "
                 "warm starts).",
        pins=("tests/test_program_cache.py::test_programs_that_call_lapack_load_untraced_in_a_new_process",),
    ),
    Internal(
        names=("jax._src.config",),
        files=("pjrt_host/_program_cache.py",),
        why="programs kept on disk untraced are keyed by what their trace depends on; jax's trace-time settings "
            "(64-bit types, promotion, default precision: what jax.jit keys its own traces by) are part of it, "
            "and no public API lists them.",
        fallback="programs are compiled and kept in memory only (traced in every process), as before the "
                 "untraced store.",
        pins=("tests/test_program_cache.py::test_programs_kept_untraced_run_on_their_device_and_survive_a_new_version",),
    ),
    Internal(
        names=("jax.enable_x64._update_thread_local_hook",),
        files=("pjrt_host/_jax_settings.py",),
        why="the per-op x64 scope uses jax's state directly (swap_local / set_local) only when no hook runs "
            "on a thread-local change.",
        fallback="read with a getattr default: without it the scope uses jax's context manager (slower).",
        pins=("tests/test_torch_autoload.py::test_the_x64_scope_uses_jax_state_directly",),
    ),
    Internal(
        names=("._device_assignment",),
        files=("pjrt_host/_torch/_sharding.py",),
        why="the devices of a jax sharding in mesh order (the public device_set is unordered).",
        fallback="none: sharded 'jax' tensors fail.",
        pins=("tests/test_spmd.py::test_mesh_over_all_devices",),
        probe="jax.sharding.NamedSharding",  # a property of the class: no backend is started
    ),
    Internal(
        names=("._base",),
        files=("pjrt_host/spmd.py",),
        why="a view's base tensor (torch.Tensor._base), so that mark_sharding reshards every view of a "
            "storage.",
        fallback="none: mark_sharding fails.",
        pins=("tests/test_spmd.py::test_mark_sharding_reshards_every_view",),
        probe="torch.zeros(1)",
    ),
    Internal(
        names=("jax._src.lib",),
        files=("plugins/gpu/pjrt_host_gpu/_plugin.py",),
        why="the GPU plugin registers the jax CUDA extension's custom-call, FFI-type and Triton "
            "compilation handlers for its library through jaxlib's xla_client and triton (kept in "
            "jax._src.lib), as jax's own CUDA plugin does.",
        fallback="the Triton hook is read with getattr: without it Pallas/Triton kernels are unavailable, "
                 "with a warning; without xla_client the plugin's library_loaded fails on a GPU "
                 "(tests/test_vendor_libraries.py runs the real library where one is installed).",
    ),
)


def by_name() -> dict[str, Internal]:
    """Each listed name -> its entry."""
    return {name: entry for entry in INTERNALS for name in entry.names}
