from talaria.cli import main

raise SystemExit(main())
