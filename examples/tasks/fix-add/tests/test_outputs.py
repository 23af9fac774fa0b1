"""Hidden tests of fix-add: `add` returns the sum for several pairs, the repository's own test included."""

import unittest

import calc


class HiddenAddTest(unittest.TestCase):
    def test_sums(self) -> None:
        for a, b in [(2, 3), (0, 0), (-4, 9), (10, 15), (7, -7)]:
            self.assertEqual(calc.add(a, b), a + b, f"add({a}, {b})")


if __name__ == "__main__":
    unittest.main()
