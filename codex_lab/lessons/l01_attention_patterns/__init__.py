"""l01_attention_patterns"""
