"""The in-process dispatcher: approved jobs run on execution nodes through the turn driver."""
