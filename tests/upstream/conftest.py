import sys
from pathlib import Path

# the tier's own helpers (envs.py) import as top-level modules
sys.path.insert(0, str(Path(__file__).parent))
