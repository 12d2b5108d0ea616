"""The frontend: grammar loading, parsing into a frozen AST, and AST printing."""
