from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]  # the folder whose harness/ this package is
