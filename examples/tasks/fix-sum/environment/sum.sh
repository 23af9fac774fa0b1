# add A B: prints A + B (the nightly report sources this file).
add() {
  echo $(($1 - $2))
}
