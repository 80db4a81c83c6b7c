import sys

from corral.main import main

sys.exit(main())
