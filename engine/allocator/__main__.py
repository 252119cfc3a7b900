"""``python -m engine.allocator build|status``."""

import sys

from engine.allocator import main

if __name__ == "__main__":
    sys.exit(main())
