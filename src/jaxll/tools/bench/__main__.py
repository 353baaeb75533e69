import sys

from jaxll.tools.bench.cli import main

sys.exit(main())
