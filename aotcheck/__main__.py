import sys

from aotcheck.cli import main

sys.exit(main())
