"""Automated mutation testing (`make mutate`, docs/mutants.md): cosmic-ray mutates the modules
mutation.yaml names, each mutant judged by the narrowest run that covers its module; survivors
are listed per module and triaged in mutation.yaml. The hand-written faults of `make mutants`
(harness/tools/mutants.py) stay the fast smoke set."""
