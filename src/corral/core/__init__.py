"""Pure scheduling policies: values in, decisions out, time passed in. No I/O, no clock reads."""
