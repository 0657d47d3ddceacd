import sys

from sites.agent.cli import main

sys.exit(main())
