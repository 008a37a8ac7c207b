import sys

from canary_audit.cli import main

sys.exit(main())
