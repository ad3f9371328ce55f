"""l07_serving"""
