"""Pure types and rules of the job lifecycle: no I/O, no imports from the rest of the package."""
