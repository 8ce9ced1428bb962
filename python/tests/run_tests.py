"""Run the Python tests (unittest, no other dependency): every test_*.py here, or the modules
named on the command line. Prints one line per test, the reason of every skip, and a closing
"python: N passed, N failed, N skipped" line; exits 1 on any failure or error."""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))


def main(argv):
    loader = unittest.TestLoader()
    if argv:
        suite = unittest.TestSuite(loader.loadTestsFromName(n) for n in argv)
    else:
        suite = loader.discover(HERE, pattern="test_*.py", top_level_dir=HERE)
    r = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    for test, reason in r.skipped:
        print("  SKIP    %s: %s" % (test.id(), reason))
    failed = len(r.failures) + len(r.errors) + len(r.unexpectedSuccesses)
    passed = r.testsRun - failed - len(r.skipped) - len(r.expectedFailures)
    print("python: %d passed, %d failed, %d skipped" % (passed, failed, len(r.skipped)))
    return 1 if failed or r.testsRun == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
