"""Budget views: the ledger's figures for the tenant's private datasets."""
