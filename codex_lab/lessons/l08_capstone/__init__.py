"""l08_capstone"""
