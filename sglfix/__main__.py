"""`python -m sglfix` runs the CLI."""

from sglfix.cli import main

if __name__ == "__main__":
    main()
