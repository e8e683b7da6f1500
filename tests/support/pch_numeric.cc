// Builds the tests' precompiled header at ARBOR_TEST_OPTIMIZE_NUMERIC (cmake/ArborTest.cmake)
// for the directories that set ARBOR_TEST_NUMERIC; nothing else.
