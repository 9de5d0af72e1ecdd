package service

// WholeSecondsUp is wholeSecondsUp, for the external tests.
var WholeSecondsUp = wholeSecondsUp
