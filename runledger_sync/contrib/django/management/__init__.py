"""Django management commands of the Runledger app."""
