from elasticctl.cli import main

raise SystemExit(main())
