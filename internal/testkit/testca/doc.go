// Package testca is a certificate authority for fencer's TLS tests. It
// issues ECDSA P-256 certificates in memory, so that tests can serve TLS and
// mutual TLS on loopback with nothing from outside the test.
//
// It is for tests only: keys are not protected, every certificate is valid
// from an hour ago for one day, and nothing is ever revoked.
package testca
