from landscape.cli import main

raise SystemExit(main())
