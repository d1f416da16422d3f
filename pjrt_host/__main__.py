from pjrt_host._cli import main

raise SystemExit(main())
