import sys

from tensorarena.cli.main import main

sys.exit(main())
