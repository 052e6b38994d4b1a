from elasticd.daemon.main import main

raise SystemExit(main())
