import sys

from ncclwatch.cli import main

sys.exit(main())
