"""Exit statuses of the ``secagg`` command, and the table of them that every
subcommand's ``--help`` ends with."""

#: Exit statuses of the ``secagg`` command.
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NO_MODEL, EXIT_INCOMPLETE, EXIT_LEAK = 0, 1, 2, 3, 4, 5
EXIT_CODES = """exit status:
  0    success
  1    error: bad input or a refused configuration (the reason is printed on stderr)
  2    usage error (unknown option, bad value)
  3    run: finished without a usable model (every phase aborted, or the privacy budget
       guard stopped it early); its outputs are still written, the reason is on stderr
  4    audit: the transcript is incomplete (truncated or altered), or, with --identities,
       a client's signed statement is missing, forged or contradicted by a record, or,
       with --node-ledger, a node's ledger file does not reconcile with the transcript
  5    audit --threat: the named coalition can read some field beyond what the layer promises
  6    dp-audit: some lower bound is above its claim (that mechanism is not DP)
  130  interrupted
Every subcommand uses this one table: a bad value of an option, on the command line or
in a config file (run --config, -c), is a usage error (2) wherever it is found."""
