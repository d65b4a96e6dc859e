"""The command line: one module per subcommand; errors become one line and an exit status here."""
