import os
import sys

# A model command goes to the warm server when the run started one (commands/warm.py,
# imported only then); everything else, and every command without a server,
# runs here.
code = None
if os.environ.get("CANARY_AUDIT_WARM"):
    from canary_audit.commands.warm import run_via_server

    code = run_via_server(sys.argv[1:])
if code is None:
    from canary_audit.commands.cli import main

    code = main()
sys.exit(code)
