"""l02_sparse_attention"""
