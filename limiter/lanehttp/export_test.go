package lanehttp

// ModelAndEstimate is the transport's one walk of a body, for the tests and
// the benchmarks of package lanehttp_test.
var ModelAndEstimate = modelAndEstimate
