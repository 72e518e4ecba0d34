from sharpscape.command import main

raise SystemExit(main(prog="python -m sharpscape"))
