"""l06_inference"""
