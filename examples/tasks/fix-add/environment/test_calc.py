import unittest

from calc import add


class AddTest(unittest.TestCase):
    def test_small_numbers(self) -> None:
        self.assertEqual(add(2, 3), 5)


if __name__ == "__main__":
    unittest.main()
