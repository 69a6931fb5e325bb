"""Benchmarks and the chaos run: test harnesses that start kvstack, never imported by it."""
