// The typed errors that cross module boundaries. Only launch/ turns them into
// exit codes: ConfigError -> 2 (bad input), everything else -> 1.
#pragma once

#include <stdexcept>
#include <string>

namespace weft {

// Base of every Weft error.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad user input. `field` is the YAML key path or flag ("train.lr", "--init-weights").
class ConfigError : public Error {
 public:
  ConfigError(std::string field, const std::string& message)
      : Error(field + ": " + message), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

// Communication failures; the elastic path catches the two subclasses.
class CommError : public Error {
 public:
  using Error::Error;
};
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};
class PeerLostError : public CommError {
 public:
  PeerLostError(int peer, const std::string& message) : CommError(message), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

class IoError : public Error {
 public:
  using Error::Error;
};
class NotSupported : public Error {
 public:
  using Error::Error;
};
// A broken internal invariant: a bug in Weft, never the user's fault.
class InternalError : public Error {
 public:
  using Error::Error;
};

}  // namespace weft
