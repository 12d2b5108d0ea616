"""Code generation and loading: turning the checked program into running Python."""
