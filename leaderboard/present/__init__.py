"""What the report, the site and the hub export show: tables and sections built from stored runs;
nothing here changes a run's numbers.
"""
