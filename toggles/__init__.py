"""Toggle files, one per upstream PR: metadata plus the patches that revert the fix (YAML data)."""
