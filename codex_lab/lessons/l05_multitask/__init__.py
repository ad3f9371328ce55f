"""l05_multitask"""
