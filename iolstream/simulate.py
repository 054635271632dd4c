"""placeholder"""
def add_parser(subparsers):
    p = subparsers.add_parser("simulate")
    return p
