"""The store: the DuckDB database built from the ingested tables and cells, its catalog, and the
hub layout it exports to and reads back.
"""
