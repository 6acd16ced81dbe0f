"""Code prompts the demo draft was not trained for: docstring-first function stubs
written for this benchmark (not from the Python standard library, which is the
demo pair's whole corpus). Used by bench/serving.py (fallback_dlm)."""

PROMPTS = [
    'def rebalance_portfolio(holdings, targets, cash):\n'
    '    """Return the trades that bring each holding to its target weight.\n\n'
    '    holdings maps ticker -> (shares, price); targets maps ticker -> weight.\n'
    '    Trades smaller than one share are dropped and cash is never negative.\n'
    '    """\n',
    'def merge_sensor_readings(streams, tolerance_ms=5):\n'
    '    """Merge timestamped readings from several sensors into one timeline.\n\n'
    '    Readings closer than tolerance_ms are averaged per sensor; gaps stay None.\n'
    '    """\n',
    'def score_crossword_grid(grid, dictionary):\n'
    '    """Count the across and down words of a crossword grid found in dictionary.\n\n'
    '    Black squares are "#"; single letters are not words.\n'
    '    """\n',
    'def schedule_irrigation(zones, forecast, max_minutes):\n'
    '    """Plan watering minutes per garden zone for the next seven days.\n\n'
    '    Rain in the forecast lowers the plan; no zone gets more than max_minutes.\n'
    '    """\n',
    'def parse_recipe_quantities(lines):\n'
    '    """Split recipe lines like "2 1/2 cups flour" into (amount, unit, item).\n\n'
    '    Mixed fractions become floats; a line without a number has amount None.\n'
    '    """\n',
    'def elevator_next_stop(current, direction, requests):\n'
    '    """Pick the floor an elevator serves next with the SCAN policy.\n\n'
    '    requests is a set of floors; direction is +1 or -1.\n'
    '    """\n',
    'def compress_gps_track(points, epsilon_m):\n'
    '    """Simplify a GPS track with Ramer-Douglas-Peucker in metres.\n\n'
    '    points are (lat, lon) pairs; the first and last are always kept.\n'
    '    """\n',
    'def tally_ranked_ballots(ballots):\n'
    '    """Run an instant-runoff count and return the winner and each round.\n\n'
    '    Each ballot lists candidates in order of preference; ties drop the\n'
    '    candidate that comes last alphabetically.\n'
    '    """\n',
]
