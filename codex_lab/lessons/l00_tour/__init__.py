"""l00_tour"""
