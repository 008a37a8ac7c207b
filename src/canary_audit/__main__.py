import sys

from canary_audit.warm import run_via_server

# A model command goes to the warm server when the run started one (warm.py);
# everything else, and every command without a server, runs here.
code = run_via_server(sys.argv[1:])
if code is None:
    from canary_audit.cli import main

    code = main()
sys.exit(code)
