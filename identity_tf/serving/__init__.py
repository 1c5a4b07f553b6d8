"""Serving: SavedModel export for TF Serving (`export`), its REST/gRPC
client (`client`) and the names both use (`contract`)."""
