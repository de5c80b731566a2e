"""A Flower app running secagg's FedLog under SecureSum (or Plaintext) on digits."""
