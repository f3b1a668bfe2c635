import sys

from gpumagic.cli import main

sys.exit(main())
