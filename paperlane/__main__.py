from paperlane.cli import main

main()
