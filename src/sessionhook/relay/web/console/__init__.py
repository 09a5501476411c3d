"""The web console: pages, actions, the live feed, the chart.
"""
