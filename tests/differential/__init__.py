"""Differential testing of idivm against recomputation on a real PostgreSQL.

``schemas`` holds the base-table DDL, ``views`` the catalogue of test views, ``workload`` the
seeded data and DML generators and ``harness`` the driver that compares maintained views with
the view query recomputed from scratch.
"""
