"""The definitions loaded by ``dg.load_from_defs_folder``: one concern per module."""
